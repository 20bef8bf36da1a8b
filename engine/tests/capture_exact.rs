//! Proof that capture is exact: replaying the captured page sets onto a copy
//! of the database taken before the first transaction reproduces the
//! primary page for page after every transaction.

mod common;

use common::{Op, Recorder, Workload, apply, assert_same_pages, create_db, seeds, soak};
use std::sync::Arc;
use walrelay_engine::{Constraint, Database, Options, Sequence, Synchronous};

/// What a run exercised, so the test can show it covered the hard cases.
#[derive(Debug, Default)]
struct Coverage {
    transactions: usize,
    wal_generations: usize,
    failed_batches: usize,
    /// Writes landing on frames already written in the same transaction
    /// (pages rewritten after a spill, checksum rewrites, savepoint rewinds).
    overwrites: u64,
    /// Transactions that spilled frames and then rolled back.
    spilled_rollbacks: u64,
}

fn run_seed(seed: u64, steps: usize) -> Coverage {
    let mut cov = Coverage::default();
    let mut salt = None;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("primary.db");
    let mut w = Workload::new(seed, 0);
    let page_size = [512u32, 1024, 4096][seed as usize % 3];
    w.page_size = page_size as usize;
    create_db(&path, page_size);
    let copy = dir.path().join("replayed.db");
    std::fs::copy(&path, &copy).expect("copy before the first transaction");

    let rec = Arc::new(Recorder::default());
    let opts = Options {
        readers: 2,
        synchronous: Synchronous::Off,
        // Small caches force spills; small thresholds force engine checkpoints.
        writer_cache_size_pages: Some([10u32, 16, 50, 2000][(seed >> 3) as usize % 4]),
        checkpoint_threshold_frames: [64u32, 500, 100_000][(seed >> 5) as usize % 3],
        sink: Some(rec.clone()),
        ..Options::default()
    };
    let db = Database::open(&path, opts).expect("open");
    let s = db.session(Constraint::FirstPrimary).expect("session");
    let mut last_seq = 0u64;
    for step in 0..steps {
        let op = w.next_op();
        let before = rec.len();
        let context = format!("seed {seed} step {step} op {op:?}");
        let failed_as_expected = w
            .apply(&db, &s, &op)
            .unwrap_or_else(|e| panic!("{context}: unexpected error {e}"));
        let new = rec.since(before);
        if failed_as_expected {
            cov.failed_batches += 1;
            assert!(
                new.is_empty(),
                "{context}: a rolled-back batch was captured"
            );
        }
        if matches!(op, Op::Checkpoint(_)) {
            assert!(
                new.is_empty(),
                "{context}: a checkpoint was captured as a transaction"
            );
        }
        for (b, txn) in &new {
            last_seq += 1;
            cov.transactions += 1;
            if salt != Some(txn.wal.salt) {
                salt = Some(txn.wal.salt);
                cov.wal_generations += 1;
            }
            assert_eq!(
                b.sequence,
                Sequence(last_seq),
                "{context}: bookmarks are dense and ordered"
            );
            apply(&copy, &txn.pages);
        }
        if !new.is_empty() {
            assert_eq!(
                s.bookmark(),
                Some(db.latest_bookmark()),
                "{context}: session saw its write"
            );
        }
        assert_same_pages(&copy, &s, &context);
    }
    let stats = db.capture_stats().expect("a primary");
    cov.overwrites = stats.overwrites;
    cov.spilled_rollbacks = stats.rolled_back_holds;
    drop(s);
    drop(db);
    cov
}

#[test]
fn replaying_captured_page_sets_reproduces_the_primary_after_every_transaction() {
    let steps = if soak() { 1500 } else { 150 };
    for seed in seeds(6, 60) {
        eprintln!("capture_exact seed={seed} steps={steps} (replay: WALRELAY_SEED={seed})");
        let cov = run_seed(seed, steps);
        eprintln!("  covered {cov:?}");
        assert!(
            cov.transactions > steps / 2,
            "the workload commits most steps"
        );
    }
}

#[test]
fn fixed_seed_replay_of_the_capture_workload() {
    let (mut restarts, mut overwrites, mut spilled_rollbacks) = (0, 0, 0);
    for seed in [1u64, 42, 0xdead_beef] {
        let cov = run_seed(seed, 120);
        eprintln!("seed {seed}: {cov:?}");
        assert!(
            cov.failed_batches > 0,
            "seed {seed} exercises rolled-back batches"
        );
        restarts += cov.wal_generations - 1;
        overwrites += cov.overwrites;
        spilled_rollbacks += cov.spilled_rollbacks;
    }
    assert!(restarts > 0, "the fixed seeds exercise WAL restarts");
    assert!(overwrites > 0, "the fixed seeds rewrite frames in place");
    assert!(
        spilled_rollbacks > 0,
        "the fixed seeds roll back transactions that spilled"
    );
}
