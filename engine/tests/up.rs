//! `walrelay up`, the README's main command: a local cluster of real
//! processes that reports commit latency and confirm lag, and stops
//! cleanly on Ctrl-C (SIGINT) — every process, with the primary's commits
//! all confirmed — and starts again from the same directory.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A base port with every port `up` derives from it free: the primary and
/// followers use base..=base+5, HTTP base+10..=base+12.
fn free_base() -> u16 {
    common::free_port_base(13)
}

/// Runs `up` until it has reported twice, calls `before_stop(base)`, then
/// sends SIGINT; returns every line printed and how long `up` took to exit
/// after the signal.
fn run_up(
    dir: &std::path::Path,
    base: u16,
    before_stop: impl FnOnce(u16),
) -> (Vec<String>, Duration) {
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
    before_stop(base);
    // What a terminal's Ctrl-C does: SIGINT to the foreground process
    // group, which `up` leads here.
    // SAFETY: kill(2) with SIGINT on the process group of our own child.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGINT);
    }
    let signalled = Instant::now();
    // Bounded: a regression that hangs the stop fails here instead of
    // hanging the test.
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if signalled.elapsed() > Duration::from_secs(60) {
            // SAFETY: kill(2) with SIGKILL on the process group of our own
            // child.
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("up did not stop within 60 s of SIGINT: {lines:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    lines.extend(rx.try_iter());
    // Anything still printing arrives shortly after the exit.
    std::thread::sleep(Duration::from_millis(100));
    lines.extend(rx.try_iter());
    assert!(status.success(), "up exited with {status}: {lines:#?}");
    (lines, took)
}

#[test]
fn up_runs_a_cluster_reports_latency_and_lag_and_stops_cleanly_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let (lines, _) = run_up(dir.path(), base, |_| {});
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(has("primary stopped cleanly at"), "{lines:#?}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("stopping at")).count(),
        7,
        "five followers and two replicas stop: {lines:#?}"
    );
    assert!(has("walrelay up: stopped"));

    // Again from the same directory: the log continues in a new epoch.
    let (lines, _) = run_up(dir.path(), base, |_| {});
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

#[test]
fn up_stops_promptly_on_ctrl_c_with_runaway_queries_running_and_starts_again() {
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let runaways = std::sync::Mutex::new(Vec::new());
    let start_runaways = |base: u16| {
        // Five on the primary, two on each replica: each would run for
        // the whole 30 s query time limit.
        let mut sockets = runaways.lock().expect("lock");
        for (port, n) in [(base + 10, 5), (base + 11, 2), (base + 12, 2)] {
            for _ in 0..n {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                sockets.push(common::send_query(addr, common::RUNAWAY));
            }
        }
        // Let them reach SQLite.
        std::thread::sleep(Duration::from_millis(500));
    };
    let (lines, took) = run_up(dir.path(), base, start_runaways);
    println!("up stopped {took:?} after SIGINT with runaway queries running");
    // Generous: proves it does not hang (30 s runaways, a 2 s HTTP grace).
    assert!(
        took < Duration::from_secs(15),
        "stopping took {took:?}: {lines:#?}"
    );
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(has("primary stopped cleanly at"), "{lines:#?}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("stopping at")).count(),
        7,
        "five followers and two replicas stop: {lines:#?}"
    );
    // Each runaway was running and was answered: cancelled (503), not
    // left hanging.
    for mut socket in runaways.into_inner().expect("lock") {
        use std::io::Read;
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut answer = String::new();
        let _ = socket.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    }

    let (lines, _) = run_up(dir.path(), base, |_| {});
    assert!(
        lines
            .iter()
            .any(|l| l.contains("primary stopped cleanly at 00000002-")),
        "restartable from the same directory: {lines:#?}"
    );
}
