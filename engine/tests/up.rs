//! `walrelay up`, the README's main command: a local cluster of real
//! processes that reports commit latency and confirm lag, and stops
//! cleanly on Ctrl-C (SIGINT) — every process, with the primary's commits
//! all confirmed — and starts again from the same directory.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
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

/// Runs `up` (with `extra` arguments) until the primary and a replica
/// have each reported twice, calls `while_up` with the lines so far, then
/// sends SIGINT; returns every line printed (stdout and stderr).
fn run_up(
    dir: &std::path::Path,
    base: u16,
    extra: &[&str],
    while_up: impl FnOnce(&[String]),
) -> Vec<String> {
    let dir_arg = dir.display().to_string();
    let base_arg = base.to_string();
    let mut args = vec![
        "up",
        "--dir",
        &dir_arg,
        "--base-port",
        &base_arg,
        "--writers",
        "2",
    ];
    args.extend(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(&args)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn walrelay up");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(line);
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
    while_up(&lines);
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

/// One `up` cluster at a time: each takes a range of fixed ports and
/// several cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A curl-like request to a replica's query endpoint: the status.
fn curl(base: u16, authorization: Option<&str>) -> u16 {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(20)))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut req = agent
        .post(format!(
            "http://127.0.0.1:{}/v1/databases/main/query",
            base + 11
        ))
        .header("x-d1-bookmark", "first-unconstrained");
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    req.send(r#"{"sql":"SELECT count(*) FROM events"}"#)
        .expect("the replica answers")
        .status()
        .as_u16()
}

#[test]
fn up_runs_a_cluster_reports_latency_and_lag_and_stops_cleanly_on_ctrl_c() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let token_file = dir.path().join("token");
    let lines = run_up(dir.path(), base, &[], |lines| {
        // Authentication is on by default, with an admin token on disk
        // for the owner only, and the printed curl example uses it.
        let mode = std::fs::metadata(&token_file)
            .expect("up wrote DIR/token")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "DIR/token is the owner's only");
        assert!(dir.path().join("tokens").exists(), "the token store");
        assert!(
            lines.iter().any(|l| l.contains("curl")
                && l.contains(&format!(
                    "Authorization: Bearer $(cat {})",
                    token_file.display()
                ))),
            "{lines:#?}"
        );
        let token = std::fs::read_to_string(&token_file).expect("token");
        assert_eq!(curl(base, None), 401, "no token");
        assert_eq!(
            curl(base, Some(&format!("Bearer {}", token.trim()))),
            200,
            "the admin token"
        );
    });
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(has("primary stopped cleanly at"), "{lines:#?}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("stopping at")).count(),
        7,
        "five followers and two replicas stop: {lines:#?}"
    );
    assert!(has("walrelay up: stopped"));
    assert!(!has("WARNING"), "no insecure warning: {lines:#?}");

    // Again from the same directory: the log continues in a new epoch,
    // and the token minted on the first start still works.
    let token = std::fs::read_to_string(&token_file).expect("token");
    let lines = run_up(dir.path(), base, &[], |_| {
        assert_eq!(curl(base, Some(&format!("Bearer {}", token.trim()))), 200);
    });
    assert_eq!(
        std::fs::read_to_string(&token_file).expect("token"),
        token,
        "the token is minted once"
    );
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
fn up_insecure_serves_without_a_token_and_warns_on_every_start() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let lines = run_up(dir.path(), base, &["--insecure"], |_| {
        assert_eq!(curl(base, None), 200, "no token needed");
    });
    let warnings: usize = lines.iter().map(|l| l.matches("WARNING").count()).sum();
    // up itself, the primary and both replicas.
    assert!(warnings >= 4, "{lines:#?}");
    assert!(!dir.path().join("token").exists(), "no token minted");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("curl") && !l.contains("Authorization")),
        "{lines:#?}"
    );
}
