//! A replica killed with SIGKILL at random points during appends, confirms,
//! persists and opens always reopens to exactly a confirmed prefix.
//!
//! The parent records a primary workload's page sets to a file, then runs
//! child processes (this test binary again, in child mode) that apply it to
//! a replica and are killed after a random delay. After every kill the
//! parent reopens the replica and checks it: integrity, content equal to
//! the primary's at the reopened bookmark, and that bookmark no later than
//! the last one a child had started to confirm.

mod common;

use bytes::Bytes;
use common::Recorder;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_engine::{
    Bookmark, Constraint, Database, Epoch, Options, PageNo, PageSet, Replica, ReplicaOptions,
    Sequence, Value,
};

const CHILD_ENV: &str = "WALRELAY_CRASH_CHILD";

fn pad_len(i: u64) -> i64 {
    [10, 300, 5_000, 40, 12_000][(i % 5) as usize]
}

/// The log file: for each transaction, epoch u32, sequence u64, page size
/// u32, db size u32, page count u32, then (page number u32, image) pairs;
/// all big-endian. Test-only.
fn write_log(path: &Path, txns: &[(Bookmark, PageSet)]) {
    let mut out = Vec::new();
    for (b, ps) in txns {
        out.extend_from_slice(&b.epoch.0.to_be_bytes());
        out.extend_from_slice(&b.sequence.0.to_be_bytes());
        out.extend_from_slice(&ps.page_size().to_be_bytes());
        out.extend_from_slice(&ps.db_size_pages().to_be_bytes());
        out.extend_from_slice(&(ps.len() as u32).to_be_bytes());
        for (no, image) in ps.pages() {
            out.extend_from_slice(&no.get().to_be_bytes());
            out.extend_from_slice(image);
        }
    }
    std::fs::write(path, out).expect("write log");
}

fn read_log(path: &Path) -> Vec<(Bookmark, PageSet)> {
    let data = std::fs::read(path).expect("read log");
    let mut at = 0;
    let mut take = |n: usize| {
        let s = &data[at..at + n];
        at += n;
        s.to_vec()
    };
    let mut txns = Vec::new();
    let total = data.len();
    let mut consumed = 0;
    while consumed < total {
        let u32_of = |b: Vec<u8>| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let epoch = u32_of(take(4));
        let seq = u64::from_be_bytes(take(8).try_into().expect("8 bytes"));
        let page_size = u32_of(take(4));
        let db_size = u32_of(take(4));
        let n = u32_of(take(4));
        let mut pages = Vec::new();
        for _ in 0..n {
            let no = u32_of(take(4));
            pages.push((PageNo::new(no), Bytes::from(take(page_size as usize))));
        }
        consumed += 24 + n as usize * (4 + page_size as usize);
        txns.push((
            Bookmark::new(Epoch(epoch), Sequence(seq)),
            PageSet::new(page_size, db_size, pages).expect("valid page set"),
        ));
    }
    txns
}

fn replica_options(initial: Bookmark, persist_every: u32) -> ReplicaOptions {
    ReplicaOptions {
        readers: 1,
        checkpoint_threshold_frames: 40,
        persist_every_confirms: persist_every,
        persist_min_interval_ms: 0,
        initial_bookmark: initial,
        ..ReplicaOptions::default()
    }
}

/// Child mode: apply the log to the replica from where it stands, confirming
/// with a random lag, until killed.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let seed: u64 = std::env::var("WALRELAY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let log = read_log(&dir.join("log.bin"));
    let initial = Bookmark::new(log[0].0.epoch, Sequence(0));
    let replica = Replica::open(
        dir.join("replica.db"),
        replica_options(initial, (seed % 5 + 1) as u32),
    )
    .expect("child opens the replica");
    let mut out = std::io::stdout().lock();
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = log
        .iter()
        .position(|(b, _)| *b > replica.last_appended())
        .unwrap_or(log.len());
    writeln!(out, "opened {}", replica.confirmed().sequence.0).expect("stdout");
    out.flush().expect("flush");
    while next < log.len() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let end = (next + (rng % 5) as usize + 1).min(log.len());
        for (b, ps) in &log[next..end] {
            replica.append(*b, ps).expect("append");
        }
        if rng % 17 == 0 {
            replica.discard_unconfirmed().expect("discard");
            next = log
                .iter()
                .position(|(b, _)| *b > replica.last_appended())
                .unwrap_or(log.len());
            continue;
        }
        let upto = next + (rng >> 9) as usize % (end - next);
        for (b, _) in [&log[upto], &log[end - 1]] {
            writeln!(out, "confirming {}", b.sequence.0).expect("stdout");
            out.flush().expect("flush");
            replica.confirm(*b).expect("confirm");
        }
        if rng % 7 == 0 {
            replica.persist().expect("persist");
        }
        next = end;
    }
    replica.persist().expect("persist");
    writeln!(out, "done").expect("stdout");
    out.flush().expect("flush");
    std::thread::sleep(Duration::from_secs(600));
}

/// What the replica must hold at a bookmark: log rows 1..=seq-1 (the setup
/// transaction is sequence 1).
fn check_replica(
    dir: &Path,
    initial: Bookmark,
    pages_at: &dyn Fn(u64) -> Option<Vec<Vec<u8>>>,
) -> u64 {
    let replica =
        Replica::open(dir.join("replica.db"), replica_options(initial, 1)).expect("reopen");
    let at = replica.confirmed().sequence.0;
    let s = replica
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    let ok = s
        .prepare("PRAGMA integrity_check")
        .first()
        .expect("check")
        .expect("row");
    assert_eq!(
        ok.get("integrity_check"),
        Some(&Value::from("ok")),
        "integrity at {at}"
    );
    if at >= 1 {
        let r = s
            .prepare("SELECT count(*) AS n, coalesce(max(seq), 0) AS m, coalesce(sum(length(pad)), 0) AS bytes FROM log")
            .first()
            .expect("read")
            .expect("row");
        let n = at as i64 - 1;
        assert_eq!(r.get("n"), Some(&Value::Integer(n)), "row count at {at}");
        assert_eq!(r.get("m"), Some(&Value::Integer(n)), "max seq at {at}");
        let bytes: i64 = (1..=n as u64).map(pad_len).sum();
        assert_eq!(
            r.get("bytes"),
            Some(&Value::Integer(bytes)),
            "payload at {at}"
        );
    }
    if let Some(want) = pages_at(at) {
        assert!(
            common::logical_pages(&s) == want,
            "replica pages equal the primary's at {at}"
        );
    }
    at
}

#[test]
fn a_replica_killed_at_random_points_reopens_to_exactly_a_confirmed_prefix() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = Arc::new(Recorder::default());
    let db = Database::open(
        dir.path().join("primary.db"),
        Options {
            sink: Some(rec.clone()),
            ..Options::default()
        },
    )
    .expect("primary");
    drop(
        Replica::clone_of(
            &db,
            dir.path().join("replica.db"),
            replica_options(db.latest_bookmark(), 1),
        )
        .expect("clone"),
    );
    let initial = db.latest_bookmark();
    // A pristine copy of the new replica: restored whenever a child gets to
    // the end, so that kills keep landing in the middle of the work.
    let pristine = dir.path().join("pristine");
    std::fs::create_dir(&pristine).expect("mkdir");
    let replica_files = ["replica.db", "replica.db-walrelay-replica"];
    for f in replica_files {
        std::fs::copy(dir.path().join(f), pristine.join(f)).expect("save pristine");
    }
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE log(seq INTEGER PRIMARY KEY, pad BLOB)")
        .run()
        .expect("create");
    let n: u64 = if common::soak() { 1_500 } else { 300 };
    // Snapshots of the primary's pages at a few bookmarks, for an exact check.
    let mut snapshots = std::collections::HashMap::new();
    for i in 1..=n {
        s.prepare("INSERT INTO log(seq, pad) VALUES (?1, zeroblob(?2))")
            .bind([i as i64, pad_len(i)])
            .run()
            .expect("insert");
        if i % 50 == 0 {
            snapshots.insert(i + 1, common::logical_pages(&s));
        }
    }
    let log: Vec<(Bookmark, PageSet)> = rec
        .since(0)
        .into_iter()
        .map(|(b, t)| (b, t.pages))
        .collect();
    assert_eq!(log.len() as u64, n + 1);
    write_log(&dir.path().join("log.bin"), &log);
    drop(s);
    drop(db);
    let pages_at = |at: u64| snapshots.get(&at).cloned();

    let cycles = if common::soak() { 400 } else { 40 };
    let exe = std::env::current_exe().expect("test binary");
    let mut bound = 0u64; // highest sequence any child started to confirm
    let mut last = 0u64;
    let (mut mid_run_kills, mut completed) = (0, 0);
    let mut trail = Vec::new();
    let mut rng = 0x853c_49e6_748f_ea9bu64;
    let started = Instant::now();
    for cycle in 0..cycles {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = Duration::from_micros(1_000 + rng % 12_000);
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .env("WALRELAY_CRASH_SEED", (cycle as u64 + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        // Half the kills count from spawn (and so also land while the child
        // opens and cuts the replica); half from the moment it has opened,
        // so that a slow start cannot keep kills away from the apply loop.
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut text = String::new();
        if cycle % 2 == 1 {
            let mut line = String::new();
            while stdout.read_line(&mut line).expect("read") > 0 {
                // libtest prints "test crash_child ... " before the test's own
                // output, on the same line.
                let opened = line.contains("opened ");
                text.push_str(&line);
                line.clear();
                if opened {
                    break;
                }
            }
        }
        std::thread::sleep(delay);
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        stdout.read_to_string(&mut text).expect("read stdout");
        for line in text.lines() {
            if let Some((_, seq)) = line.split_once("confirming ") {
                bound = bound.max(seq.trim().parse().expect("seq"));
            }
        }
        let at = check_replica(dir.path(), initial, &pages_at);
        assert!(
            at <= bound,
            "cycle {cycle}: reopened at {at}, beyond anything confirmed ({bound})"
        );
        assert!(
            at >= last,
            "cycle {cycle}: the durable watermark went back from {last} to {at}"
        );
        last = at;
        trail.push(at);
        if at > 1 && at < n + 1 {
            mid_run_kills += 1;
        }
        if at == n + 1 {
            completed += 1;
            for f in ["replica.db-wal", "replica.db-shm"] {
                let _ = std::fs::remove_file(dir.path().join(f));
            }
            for f in replica_files {
                std::fs::copy(pristine.join(f), dir.path().join(f)).expect("restore pristine");
            }
            (bound, last) = (0, 0);
        }
    }
    eprintln!(
        "{cycles} kills in {:?}: {mid_run_kills} left the replica mid-log, {completed} runs completed",
        started.elapsed()
    );
    eprintln!("watermark after each kill: {trail:?}");
    assert!(
        mid_run_kills >= cycles / 4,
        "most kills land mid-apply ({mid_run_kills} of {cycles})"
    );
    // Finally let a child finish, and check the whole log arrived.
    let mut child = Command::new(&exe)
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    for line in BufReader::new(stdout).lines() {
        if line.expect("line").ends_with("done") {
            break;
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert_eq!(check_replica(dir.path(), initial, &pages_at), n + 1);
}
