//! Replicas: apply, the commit watermark, and what readers may see.

mod common;

use common::{Recorder, Workload, logical_pages, seeds, soak};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use walrelay_engine::{
    Bookmark, Constraint, Database, Options, QueryError, Replica, ReplicaOptions, Sequence,
    Synchronous, Value, pair,
};

fn replica_options() -> ReplicaOptions {
    ReplicaOptions {
        readers: 2,
        checkpoint_threshold_frames: 64,
        persist_every_confirms: 16,
        persist_min_interval_ms: 0,
        max_wait_ms: 200,
        ..ReplicaOptions::default()
    }
}

/// A primary at `dir/p.db` paired with a replica at `dir/r.db`.
fn paired(
    dir: &tempfile::TempDir,
    options: Options,
    replica_options: ReplicaOptions,
) -> (Database, Replica) {
    pair(
        dir.path().join("p.db"),
        dir.path().join("r.db"),
        options,
        replica_options,
    )
    .expect("pair")
}

/// A primary whose commits are recorded (not fed anywhere), and a replica
/// cloned from it: tests feed the replica by hand.
fn recorded_primary_and_replica(
    dir: &tempfile::TempDir,
    options: Options,
    replica_options: ReplicaOptions,
) -> (Database, Arc<Recorder>, Replica) {
    let rec = Arc::new(Recorder::default());
    let db = Database::open(
        dir.path().join("p.db"),
        Options {
            sink: Some(rec.clone()),
            ..options
        },
    )
    .expect("open");
    let replica = Replica::clone_of(&db, dir.path().join("r.db"), replica_options).expect("clone");
    (db, rec, replica)
}

fn run_mirrored(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let page_size = [512u32, 1024, 4096][seed as usize % 3];
    let primary_path = dir.path().join("primary.db");
    common::create_db(&primary_path, page_size);
    let opts = Options {
        readers: 2,
        synchronous: Synchronous::Off,
        writer_cache_size_pages: Some([10u32, 50, 2000][(seed >> 3) as usize % 3]),
        checkpoint_threshold_frames: 200,
        ..Options::default()
    };
    let (db, replica) = pair(
        &primary_path,
        dir.path().join("replica.db"),
        opts,
        replica_options(),
    )
    .expect("pair");
    let mut w = Workload::new(seed, page_size as usize);
    let ps = db
        .session(Constraint::FirstPrimary)
        .expect("primary session");
    let rs = replica
        .session(Constraint::FirstUnconstrained)
        .expect("replica session");
    for step in 0..steps {
        let op = w.next_op();
        let context = format!("seed {seed} step {step} op {op:?}");
        w.apply(&db, &ps, &op)
            .unwrap_or_else(|e| panic!("{context}: {e}"));
        assert_eq!(
            replica.confirmed(),
            db.latest_bookmark(),
            "{context}: replica kept up"
        );
        let want = logical_pages(&ps);
        let got = logical_pages(&rs);
        assert_eq!(got.len(), want.len(), "{context}: replica size");
        assert!(
            got == want,
            "{context}: replica equals the primary at {}",
            db.latest_bookmark()
        );
    }
}

#[test]
fn a_paired_replica_equals_the_primary_after_every_confirm() {
    let steps = if soak() { 800 } else { 120 };
    for seed in seeds(3, 30) {
        eprintln!("replica mirror seed={seed} steps={steps} (replay: WALRELAY_SEED={seed})");
        run_mirrored(seed, steps);
    }
}

#[test]
fn fixed_seed_mirror_of_the_capture_workload() {
    for seed in [7u64, 1_000_003] {
        run_mirrored(seed, 100);
    }
}

#[test]
fn a_replica_refuses_writes_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, replica) = paired(&dir, Options::default(), replica_options());
    let ps = db.session(Constraint::FirstPrimary).expect("session");
    ps.prepare("CREATE TABLE t(x)").run().expect("create");
    let rs = replica
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    for sql in [
        "INSERT INTO t VALUES (1)",
        "CREATE TABLE u(x)",
        "DELETE FROM t",
    ] {
        let e = rs.prepare(sql).run().expect_err("refused");
        assert!(matches!(e, QueryError::ReadOnlyReplica), "{sql}: {e:?}");
        assert!(e.to_string().contains("read replica"), "{e}");
    }
    let e = rs
        .batch([rs.prepare("SELECT 1")])
        .expect_err("batches are writes");
    assert!(matches!(e, QueryError::ReadOnlyReplica), "{e:?}");
    let r = rs
        .prepare("SELECT count(*) AS n FROM t")
        .first()
        .expect("read")
        .expect("row");
    assert_eq!(r.get("n"), Some(&Value::Integer(0)));
    let meta = rs.prepare("SELECT 1").all().expect("read").meta;
    assert!(!meta.served_by_primary);
    assert_eq!(meta.bookmark, db.latest_bookmark());
}

#[test]
fn a_read_ahead_of_the_replica_waits_for_the_confirm_or_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, rec, replica) =
        recorded_primary_and_replica(&dir, Options::default(), replica_options());
    let ps = db.session(Constraint::FirstPrimary).expect("session");
    ps.prepare("CREATE TABLE t(x)").run().expect("create");
    let ahead = ps.bookmark().expect("wrote");
    let rs = replica
        .session(Constraint::Bookmark(ahead))
        .expect("session");
    let e = rs
        .prepare("SELECT count(*) FROM t")
        .all()
        .expect_err("behind");
    assert!(matches!(e, QueryError::ReplicaBehind { .. }), "{e:?}");
    let (b, txn) = rec.since(0).pop().expect("captured");
    replica.append(b, &txn.pages).expect("append");
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            replica.confirm(b).expect("confirm");
        });
        let r = rs
            .prepare("SELECT count(*) AS n FROM t")
            .first()
            .expect("waited")
            .expect("row");
        assert_eq!(r.get("n"), Some(&Value::Integer(0)));
    });
}

/// Accounts whose balances always sum to the same total, and a log row per
/// transaction: the reader-visible invariants of the next test.
const ACCOUNTS: i64 = 16;
const TOTAL: i64 = ACCOUNTS * 1_000;

#[test]
fn readers_never_see_a_partial_or_unconfirmed_transaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, rec, replica) = recorded_primary_and_replica(
        &dir,
        Options {
            synchronous: Synchronous::Off,
            ..Options::default()
        },
        ReplicaOptions {
            readers: 3,
            checkpoint_threshold_frames: 256,
            ..replica_options()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.batch([
        s.prepare("CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER NOT NULL)"),
        s.prepare("CREATE TABLE log(seq INTEGER PRIMARY KEY, pad BLOB)"),
        s.prepare(format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ACCOUNTS}) \
             INSERT INTO acct SELECT i, 1000 FROM n"
        )),
    ])
    .expect("setup");
    let txns: u64 = if soak() { 20_000 } else { 3_000 };
    for i in 1..=txns {
        let (a, b) = (
            (i * 7) % ACCOUNTS as u64 + 1,
            (i * 13 + 5) % ACCOUNTS as u64 + 1,
        );
        let amount = (i % 97) as i64;
        // Some transactions span several pages (and so several frames).
        let pad = if i % 10 == 0 { 9_000 } else { 20 };
        s.batch([
            s.prepare("UPDATE acct SET bal = bal - ?1 WHERE id = ?2")
                .bind([amount, a as i64]),
            s.prepare("UPDATE acct SET bal = bal + ?1 WHERE id = ?2")
                .bind([amount, b as i64]),
            s.prepare("INSERT INTO log(seq, pad) VALUES (?1, zeroblob(?2))")
                .bind([i as i64, pad]),
        ])
        .expect("transfer");
    }
    let log = rec.since(0);
    assert_eq!(log.len() as u64, txns + 1);
    // The setup transaction first, so that readers find the tables.
    replica
        .append(log[0].0, &log[0].1.pages)
        .expect("append setup");
    replica.confirm(log[0].0).expect("confirm setup");

    // The log table's seq i is written by bookmark sequence i + 1.
    let confirm_started = AtomicU64::new(0); // highest seq whose confirm began
    let confirm_done = AtomicU64::new(0); // highest seq whose confirm returned
    let applying = AtomicBool::new(true);
    let reads = AtomicU64::new(0);
    let reads_during_apply = AtomicU64::new(0);
    let target_reads: u64 = if soak() { 1_000_000 } else { 100_000 };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut next = 1usize;
            while next < log.len() {
                // Append a few ahead, then confirm some prefix of them.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let ahead = (rng % 4 + 1) as usize;
                let end = (next + ahead).min(log.len());
                for (b, t) in &log[next..end] {
                    replica.append(*b, &t.pages).expect("append");
                }
                let upto = next + (rng >> 8) as usize % (end - next);
                let b = log[upto].0;
                confirm_started.store(b.sequence.0 - 1, Ordering::SeqCst);
                replica.confirm(b).expect("confirm");
                confirm_done.store(b.sequence.0 - 1, Ordering::SeqCst);
                confirm_started.store(log[end - 1].0.sequence.0 - 1, Ordering::SeqCst);
                replica.confirm(log[end - 1].0).expect("confirm rest");
                confirm_done.store(log[end - 1].0.sequence.0 - 1, Ordering::SeqCst);
                next = end;
                if rng % 8 == 0 {
                    std::thread::yield_now();
                }
            }
            applying.store(false, Ordering::SeqCst);
        });
        for _ in 0..3 {
            scope.spawn(|| {
                let rs = replica.session(Constraint::FirstUnconstrained).expect("session");
                while applying.load(Ordering::SeqCst) || reads.load(Ordering::Relaxed) < target_reads {
                    let floor = confirm_done.load(Ordering::SeqCst);
                    let r = rs
                        .prepare("SELECT (SELECT sum(bal) FROM acct), (SELECT coalesce(max(seq), 0) FROM log), (SELECT count(*) FROM log)")
                        .raw()
                        .expect("read");
                    let ceiling = confirm_started.load(Ordering::SeqCst);
                    let row = &r.rows[0];
                    let (sum, max, count) = (row[0].as_i64(), row[1].as_i64(), row[2].as_i64());
                    assert_eq!(sum, Some(TOTAL), "a partial transaction was visible");
                    let max = max.expect("int") as u64;
                    assert_eq!(count, Some(max as i64), "log rows are a prefix");
                    assert!(max <= ceiling, "saw seq {max} before its confirm (ceiling {ceiling})");
                    assert!(max >= floor, "saw seq {max} after seq {floor} was confirmed");
                    assert!(r.meta.bookmark >= Bookmark::new(r.meta.bookmark.epoch, Sequence(max + 1)));
                    reads.fetch_add(1, Ordering::Relaxed);
                    if applying.load(Ordering::Relaxed) {
                        reads_during_apply.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let n = reads.load(Ordering::Relaxed);
    let during = reads_during_apply.load(Ordering::Relaxed);
    eprintln!("{n} reads checked, {during} of them while transactions were being applied");
    assert!(n >= target_reads);
    assert!(
        during >= 10_000,
        "readers overlapped the apply ({during} reads)"
    );
    assert!(
        logical_pages(&replica.session(Constraint::FirstUnconstrained).expect("s"))
            == logical_pages(&s)
    );
}

/// The replica checkpoints at this many WAL frames; with readers running,
/// its WAL must stay within this many frames of 4 KiB pages.
const CHECKPOINT_FRAMES: u32 = 1_000;
const WAL_BOUND_FRAMES: u64 = 1_200;

#[test]
fn a_sustained_stream_keeps_the_replica_wal_bounded_while_readers_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, replica) = paired(
        &dir,
        Options {
            synchronous: Synchronous::Off,
            checkpoint_threshold_frames: 2_000,
            ..Options::default()
        },
        ReplicaOptions {
            readers: 2,
            checkpoint_threshold_frames: CHECKPOINT_FRAMES,
            persist_every_confirms: 256,
            persist_min_interval_ms: 0,
            ..ReplicaOptions::default()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        .run()
        .expect("create");
    let txns: i64 = if soak() { 1_000_000 } else { 100_000 };
    let wal = dir.path().join("r.db-wal");
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let mut max_wal = 0u64;
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let rs = replica
                    .session(Constraint::FirstUnconstrained)
                    .expect("session");
                let mut last = 0;
                while !done.load(Ordering::Relaxed) {
                    let r = rs
                        .prepare("SELECT count(*) AS n FROM t")
                        .first()
                        .expect("read")
                        .expect("row");
                    let n = r.get("n").and_then(Value::as_i64).expect("count");
                    assert!(n >= last, "a reader went back in time");
                    last = n;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let insert = s.prepare("INSERT INTO t(v) VALUES (?1)");
        for i in 0..txns {
            insert
                .clone()
                .bind([format!("row {i}")])
                .run()
                .expect("insert");
            if i % 16 == 0 {
                max_wal = max_wal.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    let bound = 32 + WAL_BOUND_FRAMES * (4096 + 24);
    eprintln!(
        "{txns} transactions, {} concurrent reads, replica WAL peaked at {max_wal} bytes (bound {bound})",
        reads.load(Ordering::Relaxed)
    );
    assert!(
        max_wal <= bound,
        "replica WAL reached {max_wal} bytes, bound {bound}"
    );
    assert_eq!(replica.confirmed(), db.latest_bookmark());
    let rs = replica
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    let r = rs
        .prepare("SELECT count(*) AS n FROM t")
        .first()
        .expect("read")
        .expect("row");
    assert_eq!(r.get("n"), Some(&Value::Integer(txns)));
}

#[test]
fn a_replica_reader_that_cached_an_older_schema_runs_statements_valid_for_the_current_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, replica) = paired(
        &dir,
        Options::default(),
        ReplicaOptions {
            readers: 1,
            ..replica_options()
        },
    );
    let w = db.session(Constraint::FirstPrimary).expect("session");
    w.prepare("CREATE TABLE t1(a, b, c, d, e)")
        .run()
        .expect("create");
    w.prepare("INSERT INTO t1 VALUES (1, 2, 3, 4, 5)")
        .run()
        .expect("insert");
    let r = replica
        .session(Constraint::Bookmark(w.bookmark().expect("wrote")))
        .expect("session");
    // The replica's only reader caches the five-column schema.
    assert_eq!(
        r.prepare("SELECT * FROM t1")
            .all()
            .expect("read")
            .results
            .len(),
        1
    );
    // The primary replaces t1; the change reaches the replica through its
    // WAL, behind the reader's cached copy.
    w.batch([
        w.prepare("DROP TABLE t1"),
        w.prepare("CREATE TABLE t1(a, b, c, d, e, f)"),
        w.prepare("INSERT INTO t1 VALUES (1, 2, 3, 4, 5, 6)"),
    ])
    .expect("replace t1");
    let r = replica
        .session(Constraint::Bookmark(w.bookmark().expect("wrote")))
        .expect("session");
    let rows = r
        .prepare("SELECT * FROM t1 UNION ALL SELECT 1, 2, 3, 4, 5, 6")
        .all()
        .expect("six columns on both sides");
    assert_eq!(rows.results.len(), 2);
    assert!(!rows.meta.served_by_primary);
}

/// Whether this process maps `path` (as a reader with `mmap_size` does).
fn mapped(path: &std::path::Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let want = path.to_str().expect("utf-8 path");
    maps.lines().any(|l| l.ends_with(want))
}

#[test]
fn replica_readers_map_the_database_and_read_right_as_it_grows_and_shrinks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let replica_path = dir.path().join("r.db");
    let (db, replica) = pair(
        dir.path().join("p.db"),
        &replica_path,
        Options::default(),
        replica_options(),
    )
    .expect("pair");
    let w = db.session(Constraint::FirstPrimary).expect("session");
    w.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        .run()
        .expect("create");
    let rows_on_replica = |n: i64| {
        let r = replica
            .session(Constraint::Bookmark(w.bookmark().expect("wrote")))
            .expect("session");
        let out = r
            .prepare("SELECT count(*) AS n, sum(length(v)) AS bytes FROM t")
            .all()
            .expect("read");
        let row = &out.results[0];
        assert_eq!(
            row.get("n"),
            Some(&Value::Integer(n)),
            "rows on the replica"
        );
        assert!(
            matches!(
                row.get("bytes"),
                Some(Value::Integer(_)) | Some(Value::Null)
            ),
            "every row's value read"
        );
    };
    // Grow past the replica's checkpoint threshold, so most pages are
    // read from the database file (mapped), not the WAL.
    for round in 0..8 {
        w.prepare(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100) \
             INSERT INTO t(v) SELECT randomblob(3000) FROM c",
        )
        .run()
        .expect("insert");
        rows_on_replica(100 * (round + 1));
    }
    assert!(
        mapped(&replica_path),
        "a replica reader maps the database file"
    );
    // Shrink it: the replica's checkpoint truncates the file its readers
    // map; they must read the smaller database, not past its end.
    w.prepare("DELETE FROM t WHERE id > 50")
        .run()
        .expect("delete");
    w.prepare("VACUUM").run().expect("vacuum");
    for _ in 0..3 {
        rows_on_replica(50);
        w.prepare("INSERT INTO t(v) VALUES (x'00')")
            .run()
            .expect("insert");
        w.prepare("DELETE FROM t WHERE v = x'00'")
            .run()
            .expect("delete");
    }
    rows_on_replica(50);
}

#[test]
fn a_fast_confirming_replica_persists_its_watermark_at_most_once_per_interval_and_on_demand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, replica) = paired(
        &dir,
        Options {
            synchronous: Synchronous::Off,
            ..Options::default()
        },
        ReplicaOptions {
            persist_every_confirms: 1,
            persist_min_interval_ms: 400,
            // A checkpoint persists the watermark too: none in this test.
            checkpoint_threshold_frames: 100_000,
            ..replica_options()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(x)").run().expect("create");
    let start = replica.persisted();
    for i in 0..50 {
        s.prepare("INSERT INTO t VALUES (?1)")
            .bind([Value::Integer(i)])
            .run()
            .expect("insert");
    }
    assert_eq!(replica.confirmed(), db.latest_bookmark());
    assert_eq!(
        replica.persisted(),
        start,
        "51 confirms within the interval persist nothing"
    );
    std::thread::sleep(std::time::Duration::from_millis(450));
    s.prepare("INSERT INTO t VALUES (50)")
        .run()
        .expect("insert");
    assert_eq!(
        replica.persisted(),
        db.latest_bookmark(),
        "the first confirm after the interval persists"
    );
    s.prepare("INSERT INTO t VALUES (51)")
        .run()
        .expect("insert");
    assert!(replica.persisted() < db.latest_bookmark());
    replica.persist().expect("persist");
    assert_eq!(
        replica.persisted(),
        db.latest_bookmark(),
        "an explicit persist is never held back"
    );
}
