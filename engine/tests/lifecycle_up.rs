//! The README's `walrelay up` with cold storage, as a user meets it: the
//! demo workload's log goes to DIR/store and leaves the followers' disks,
//! a killed primary's node comes back from the store, `walrelay restore`
//! writes the database exactly as the primary holds it, and time travel
//! works over HTTP after a restart from the same directory.

mod common;

use common::up::{Up, free_base};
use rusqlite::Connection;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Bytes under `dir` (files only).
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let m = e.metadata().expect("metadata");
            total += if m.is_dir() { du(&e.path()) } else { m.len() };
        }
    }
    total
}

/// Every page of a SQLite database as SQLite reads it (its WAL included).
fn pages(path: &Path) -> Vec<Vec<u8>> {
    let c = Connection::open(path).expect("open");
    let mut st = c
        .prepare("SELECT data FROM sqlite_dbpage ORDER BY pgno")
        .expect("dbpage");
    st.query_map([], |r| r.get::<_, Vec<u8>>(0))
        .expect("query")
        .map(|p| p.expect("page"))
        .collect()
}

fn walrelay(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(args)
        .output()
        .expect("run walrelay");
    assert!(
        out.status.success(),
        "walrelay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn up_archives_its_log_bounds_follower_disks_recovers_from_the_store_and_restores_exactly() {
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let mut up = Up::start(
        dir.path(),
        base,
        &[
            "--writers",
            "4",
            "--archive-lag-ms",
            "500",
            "--snapshot-log-bytes",
            &(16u64 << 20).to_string(),
            "--local-keep-bytes",
            "0",
        ],
    );
    up.wait_serving(2, Duration::from_secs(60));
    // The followers release archived segments: some status line shows a
    // log that no longer starts at the beginning.
    up.wait_line("a follower's released log", Duration::from_secs(180), |l| {
        l.contains("log_start=") && !l.contains("log_start=00000000-0000000000000000")
    });
    // Kill the primary: a replica takes over, and the old node comes back
    // as a replica built from cold storage (the followers no longer hold
    // the log from its first record).
    let pid: i32 = std::fs::read_to_string(dir.path().join("primary.pid"))
        .expect("primary.pid")
        .trim()
        .parse()
        .expect("pid");
    // SAFETY: kill(2) with SIGKILL on the primary process `up` started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    up.wait_line(
        "the old node bootstrapped from cold storage",
        Duration::from_secs(60),
        |l| l.contains("bootstrapped from cold storage"),
    );
    up.wait_serving(2, Duration::from_secs(60));
    let (status, lines) = up.interrupt();
    assert!(status.success(), "up stopped cleanly: {lines:#?}");

    // Each follower's disk stays within max(256 MiB, 2 x the database).
    let slot = std::fs::read_to_string(dir.path().join("primary-slot")).expect("slot");
    let primary_dir = match slot.trim() {
        "0" => dir.path().join("primary"),
        k => dir
            .path()
            .join(format!("replica-{}", k.parse::<usize>().unwrap() - 1)),
    };
    let db = primary_dir.join("db.sqlite");
    let db_bytes = std::fs::metadata(&db).expect("db").len();
    for i in 0..5 {
        let used = du(&dir.path().join(format!("follower-{i}")));
        assert!(
            used <= (256u64 << 20).max(2 * db_bytes),
            "follower {i} holds {used} bytes for a {db_bytes}-byte database"
        );
    }

    // `walrelay restore` of the newest state equals the primary page for
    // page (a clean stop archives everything confirmed).
    let out = dir.path().join("restored.db");
    let store = dir.path().join("store");
    let printed = walrelay(&[
        "restore",
        "--store",
        store.to_str().unwrap(),
        "--database",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(printed.contains("restored database 1"), "{printed}");
    let (want, got) = (pages(&db), pages(&out));
    assert_eq!(want.len(), got.len(), "page count");
    assert!(
        want == got,
        "the restored database differs from the primary"
    );

    // Restart from the same directory; time travel over HTTP.
    let mut up = Up::start(dir.path(), base, &["--writers", "1"]);
    up.wait_serving(2, Duration::from_secs(60));
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let token = up.token().expect("token");
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut r = agent
        .get(format!(
            "{}/v1/databases/main/time_travel/bookmark?timestamp={}",
            up.http(1),
            now_s - 1
        ))
        .header("authorization", format!("Bearer {token}"))
        .call()
        .expect("time travel");
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string().unwrap_or_default();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"bookmark\""), "{body}");
    let (status, lines) = up.interrupt();
    assert!(status.success(), "{lines:#?}");
}
